// dtensor/kernels/cuda/profile.cuh — where a GPU run's time goes, by kernel class, from CUDA events.
//
//   kernels::cuda::KernelProfile profile;                  // on the thread that runs the kernels
//   {
//     const kernels::cuda::KernelProfile::Scope on(profile);   // this thread's kernels are timed
//     ... the steps ...
//   }
//   for (auto [name, ms] : profile.milliseconds()) ...        // waits for the events
//
// The kernel fronts of kernels/cuda (the GEMMs, attention, norms, cross-entropy, embedding, the
// optimizer updates) open a detail::ProfiledKernel: while a profile is on for the calling thread,
// it records a CUDA event before and after the front's work on the thread's stream; a front
// called inside another (attention's GEMMs) is counted once, in the outer class. Time not in a
// class — elementwise kernels, copies, collectives, the host's gaps between launches — is what
// the run's wall time leaves (the caller's "other and idle"). Off (no profile on the thread) a
// front costs one thread-local read. The events make each front a little slower: time the steps
// without a profile and take the shares from a profiled run (train_gpt_cuda --profile-kernels).
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <cstddef>
#include <utility>
#include <vector>

#include "dtensor/core/cuda_space.cuh"

namespace dtensor::kernels::cuda {

/// The classes a profile sums by.
enum class KernelClass : int { gemm, attention, norm, cross_entropy, embedding, optimizer };
inline constexpr std::size_t kernel_class_count = 6;
inline constexpr std::array<const char*, kernel_class_count> kernel_class_names{
    "GEMMs", "attention", "norms", "cross-entropy", "embedding", "optimizer"};

class KernelProfile;

namespace detail {
/// The profile this thread's kernel fronts record into (null: none).
inline thread_local KernelProfile* active_kernel_profile = nullptr;
}  // namespace detail

/// Event pairs by kernel class on one thread's stream; summed by milliseconds().
class KernelProfile {
 public:
  KernelProfile() = default;
  KernelProfile(const KernelProfile&) = delete;
  KernelProfile& operator=(const KernelProfile&) = delete;
  ~KernelProfile() {
    for (auto& p : pairs_) cudaEventDestroy(p.start), cudaEventDestroy(p.stop);
  }

  /// Turns the profile on for the calling thread while it lives (the previous one back after).
  class Scope {
   public:
    explicit Scope(KernelProfile& p) : previous_(std::exchange(detail::active_kernel_profile, &p)) {}
    ~Scope() { detail::active_kernel_profile = previous_; }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    KernelProfile* previous_;
  };

  /// The profile on for the calling thread (null: none).
  static KernelProfile* active() noexcept { return detail::active_kernel_profile; }

  /// The milliseconds of each class since the last call (waits for the recorded events).
  std::vector<std::pair<const char*, double>> milliseconds() {
    std::array<double, kernel_class_count> ms{};
    for (std::size_t i = 0; i < used_; ++i) {
      auto& p = pairs_[i];
      DTENSOR_CUDA_CHECK(cudaEventSynchronize(p.stop));
      float t = 0;
      DTENSOR_CUDA_CHECK(cudaEventElapsedTime(&t, p.start, p.stop));
      ms[std::size_t(p.kind)] += double(t);
    }
    used_ = 0;
    std::vector<std::pair<const char*, double>> out;
    for (std::size_t c = 0; c < kernel_class_count; ++c) out.emplace_back(kernel_class_names[c], ms[c]);
    return out;
  }

  /// The fronts' side (detail::ProfiledKernel): an outermost front opens and closes a pair.
  void begin(KernelClass kind) {
    if (depth_ > 0) {
      ++depth_;
      return;
    }
    // The depth moves only once the start is recorded: a throw here leaves no open pair (the
    // front's destructor, which would call end(), does not run when its constructor throws).
    if (used_ == pairs_.size()) {
      pairs_.reserve(pairs_.size() + 1);
      Pair p{};
      DTENSOR_CUDA_CHECK(cudaEventCreate(&p.start));
      if (const cudaError_t e = cudaEventCreate(&p.stop); e != cudaSuccess) {
        cudaEventDestroy(p.start);
        DTENSOR_CUDA_CHECK(e);
      }
      pairs_.push_back(p);
    }
    auto& p = pairs_[used_];
    p.kind = kind;
    DTENSOR_CUDA_CHECK(cudaEventRecord(p.start, dtensor::cuda::current_stream()));
    depth_ = 1;
  }
  void end() noexcept {  // from a destructor: a failed record drops the pair (the next call reports the error)
    if (--depth_ > 0) return;
    if (cudaEventRecord(pairs_[used_].stop, dtensor::cuda::current_stream()) == cudaSuccess) ++used_;
  }

 private:
  struct Pair {
    cudaEvent_t start = nullptr, stop = nullptr;
    KernelClass kind = KernelClass::gemm;
  };
  std::vector<Pair> pairs_;  // reused: the first used_ hold this period's records
  std::size_t used_ = 0;
  int depth_ = 0;
};

namespace detail {
/// A kernel front's record in this thread's profile, if one is on (see the synopsis).
class ProfiledKernel {
 public:
  explicit ProfiledKernel(KernelClass kind) : profile_(active_kernel_profile) {
    if (profile_) profile_->begin(kind);
  }
  ~ProfiledKernel() {
    if (profile_) profile_->end();
  }
  ProfiledKernel(const ProfiledKernel&) = delete;
  ProfiledKernel& operator=(const ProfiledKernel&) = delete;

 private:
  KernelProfile* profile_;
};
}  // namespace detail

}  // namespace dtensor::kernels::cuda
