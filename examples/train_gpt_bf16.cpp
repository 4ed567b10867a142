// examples/train_gpt_bf16.cpp — train_gpt's --dtype bf16 run: the trainer (train_gpt.hpp) with the
// model in bfloat16 (fp32 master weights), instantiated here, apart from main's f32 one.
#include "train_gpt.hpp"

namespace examples::gpt {
int run_bf16(int argc, char** argv, const Options& o) { return run<dtensor::bfloat16>(argc, argv, o); }
}  // namespace examples::gpt
