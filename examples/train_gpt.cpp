// examples/train_gpt.cpp — train_gpt's main and its f32 run: the program is examples/train_gpt.hpp
// (read it top to bottom); --dtype bf16 is its bf16 instantiation in train_gpt_bf16.cpp, a
// translation unit of its own so that the two build in parallel.
//
// Started as `generate` (examples/CMakeLists.txt makes that link beside train_gpt), it is the
// generate program: text from a train_gpt checkpoint (the main job's: build-main/train_gpt_ckpt),
//
//   generate --resume build-main/train_gpt_ckpt --prompt "The " --generate 200 [--temperature 0.8 --top-k 20]
//   generate --resume DIR --pp 1 --fsdp 1 --cp 1 --tp 2 --ep 1      # any mesh: the checkpoint reshards
//
// the trainer's own code run with no training steps: parse_generate reads the model's shape from
// the checkpoint, the model is built and loaded on the mesh the flags give, and models::generate
// runs over its pipeline stages with a KV cache per stage (generate_text). In float: the
// checkpoint's master weights are fp32 whatever --dtype trained them.
#include <string_view>

#include "train_gpt.hpp"

namespace examples::gpt {
int run_bf16(int argc, char** argv, const Options& o);  // train_gpt_bf16.cpp
}  // namespace examples::gpt

int main(int argc, char** argv) {
  using namespace examples::gpt;
  const std::string_view name = argc > 0 ? std::string_view(argv[0]) : std::string_view();
  const bool generating = name == "generate" || name.ends_with("/generate");
  auto f32 = [](int c, char** v, const Options& o) { return run<float>(c, v, o); };
  return examples::gpt::main(argc, argv, /*cuda_build=*/false, f32, generating ? RunFn(f32) : run_bf16, generating);
}
