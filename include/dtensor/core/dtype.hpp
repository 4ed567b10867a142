// dtensor/core/dtype.hpp — element types and reduction operators.
//
//   static_assert(dtensor::Element<float>);
//   dtensor::dtype_of<bfloat16>            // DType::bfloat16
//   dtensor::reduction_identity<float>(ReduceOp::max)   // -inf
//
// The communicators move untyped bytes; DType tells them how to reduce. ReduceOp lives here,
// not in comm/, because placements (Partial<op>) name it too.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string_view>
#include <type_traits>

#include "dtensor/core/bfloat16.hpp"

namespace dtensor {

enum class DType : std::uint8_t { float32, float64, bfloat16, int32, int64, uint8 };
enum class ReduceOp : std::uint8_t { sum, avg, max, min };

template <class T>
inline constexpr bool is_element_v =
    std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, bfloat16> ||
    std::is_same_v<T, std::int32_t> || std::is_same_v<T, std::int64_t> ||
    std::is_same_v<T, std::uint8_t>;

/// The element types a Tensor, a DTensor and a communicator accept.
template <class T>
concept Element = is_element_v<T>;

template <Element T>
inline constexpr DType dtype_of = std::is_same_v<T, float>           ? DType::float32
                                  : std::is_same_v<T, double>        ? DType::float64
                                  : std::is_same_v<T, bfloat16>      ? DType::bfloat16
                                  : std::is_same_v<T, std::int32_t>  ? DType::int32
                                  : std::is_same_v<T, std::int64_t>  ? DType::int64
                                                                     : DType::uint8;

constexpr std::size_t size_of(DType t) {
  switch (t) {
    case DType::float32: return 4;
    case DType::float64: return 8;
    case DType::bfloat16: return 2;
    case DType::int32: return 4;
    case DType::int64: return 8;
    case DType::uint8: return 1;
  }
  return 0;
}

constexpr std::string_view name_of(DType t) {
  switch (t) {
    case DType::float32: return "float32";
    case DType::float64: return "float64";
    case DType::bfloat16: return "bfloat16";
    case DType::int32: return "int32";
    case DType::int64: return "int64";
    case DType::uint8: return "uint8";
  }
  return "?";
}

constexpr std::string_view name_of(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::avg: return "avg";
    case ReduceOp::max: return "max";
    case ReduceOp::min: return "min";
  }
  return "?";
}

/// The value x with op(x, v) == v: 0 for sum/avg, the lowest value for max, the highest for min.
template <Element T>
constexpr T reduction_identity(ReduceOp op) {
  switch (op) {
    case ReduceOp::max:
      return std::numeric_limits<T>::has_infinity ? T(-std::numeric_limits<T>::infinity())
                                                  : std::numeric_limits<T>::lowest();
    case ReduceOp::min:
      return std::numeric_limits<T>::has_infinity ? std::numeric_limits<T>::infinity()
                                                  : std::numeric_limits<T>::max();
    default: return T(0);
  }
}

/// Combines two values the way a reduction does (avg combines as a sum; the division by the
/// group size happens once, at the end).
template <Element T>
constexpr T reduce_pair(ReduceOp op, T a, T b) {
  switch (op) {
    case ReduceOp::max: return a < b ? b : a;
    case ReduceOp::min: return b < a ? b : a;
    default: return T(a + b);
  }
}

}  // namespace dtensor
