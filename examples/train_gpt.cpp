// examples/train_gpt.cpp — train_gpt's main and its f32 run: the program is examples/train_gpt.hpp
// (read it top to bottom); --dtype bf16 is its bf16 instantiation in train_gpt_bf16.cpp, a
// translation unit of its own so that the two build in parallel.
#include "train_gpt.hpp"

namespace examples::gpt {
int run_bf16(int argc, char** argv, const Options& o);  // train_gpt_bf16.cpp
}  // namespace examples::gpt

int main(int argc, char** argv) {
  using namespace examples::gpt;
  return examples::gpt::main(argc, argv, /*cuda_build=*/false, [](int c, char** v, const Options& o) { return run<float>(c, v, o); },
                             run_bf16);
}
