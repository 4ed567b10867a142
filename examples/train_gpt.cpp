// examples/train_gpt.cpp — train_gpt's main and its f32 run: the program is examples/train_gpt.hpp
// (read it top to bottom); --dtype bf16 is its bf16 instantiation in train_gpt_bf16.cpp, a
// translation unit of its own so that the two build in parallel. Started as `generate` (a link
// beside train_gpt, examples/CMakeLists.txt), it is the generate program: its command line is
// examples/generate.cpp's, the run the same trainer's with no training steps.
#include <string_view>

#include "train_gpt.hpp"

namespace examples::gpt {
int run_bf16(int argc, char** argv, const Options& o);  // train_gpt_bf16.cpp
int generate_main(int argc, char** argv, RunFn run_f32, bool cuda_build);  // generate.cpp
}  // namespace examples::gpt

int main(int argc, char** argv) {
  using namespace examples::gpt;
  const std::string_view name = argc > 0 ? std::string_view(argv[0]) : std::string_view();
  auto f32 = [](int c, char** v, const Options& o) { return run<float>(c, v, o); };
  if (name == "generate" || name.ends_with("/generate")) return generate_main(argc, argv, f32, /*cuda_build=*/false);
  return examples::gpt::main(argc, argv, /*cuda_build=*/false, f32, run_bf16);
}
