// examples/generate.cpp — the `generate` program's command line: text from a train_gpt
// checkpoint (the main job's: build-main/train_gpt_ckpt), the trainer (train_gpt.hpp) run with no
// training steps. Linked into train_gpt, which is `generate` when started under that name (a link
// beside it, examples/CMakeLists.txt), and into train_gpt_cuda, `generate_cuda` under that name:
// this unit holds only the parse, not the trainer's code (one object for both: no header it reads
// depends on CUDA).
//
//   generate --resume build-main/train_gpt_ckpt --prompt "The " --generate 200 [--temperature 0.8 --top-k 20]
//   generate --resume DIR --pp 1 --fsdp 1 --cp 1 --tp 2 --ep 1      # any mesh: the checkpoint reshards
//   generate_cuda --resume DIR ...                                   # a CUDA build's: on the GPU
//
// The model's shape is read from the checkpoint, the model built and loaded on the mesh the flags
// give, and models::generate runs over its pipeline stages with a KV cache per stage. In float:
// the checkpoint's master weights are fp32 whatever --dtype trained them.
#include <algorithm>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "dtensor/checkpoint/load.hpp"
#include "train_gpt.hpp"

namespace examples::gpt {

namespace {

std::string generate_usage() {
  return "usage: generate --resume DIR [--generate N] [--prompt TEXT] [--temperature T] [--top-k K] [--top-p P] "
         "[--seed S]\n"
         "                [mesh flags: --pp --dp --fsdp --cp --tp --ep --zero --sp/--no-sp --cp-kind --schedule] "
         "[--data FILE]\n"
         "       generate --init-from FILE.safetensors [model flags: --layers --heads --dim --seq --arch --kv-heads "
         "--ffn] ...\n"
         "  Text from a train_gpt checkpoint (e.g. the main job's, build-main/train_gpt_ckpt): the model's shape is "
         "read\n"
         "  from the checkpoint, its weights loaded on the mesh the flags give (any mesh: the checkpoint reshards;\n"
         "  default train_gpt's, pp 2 x fsdp 2 x cp 2 x tp 2), then N characters (default 200) after --prompt TEXT\n"
         "  (default \"The \"), greedy or sampled (--temperature T > 0, --top-k K, --top-p P; --seed S seeds the "
         "draws),\n"
         "  with a KV cache per pipeline stage (models/generate.hpp). The vocabulary is the training text's (--data, "
         "default\n"
         "  the files under /usr/share/common-licenses, as train_gpt's). The other flags are train_gpt's (train_gpt "
         "--help).\n"
         "  generate_cuda, a CUDA build's (a link beside train_gpt_cuda), takes the same flags and runs on the GPU\n"
         "  (--device cuda, its default): the weights and the KV caches in device memory, the host's choice of each\n"
         "  token.\n";
}

/// The checkpoint's model flags (a train_gpt checkpoint's configuration), for train_gpt's parse.
std::vector<std::string> model_flags_of(const std::string& resume) {
  std::map<std::string, std::string> config;
  try {
    config = checkpoint::read_manifest(resume).meta.config;
  } catch (const std::exception& e) {
    throw UsageError(std::string("--resume ") + resume + ": " + e.what());
  }
  auto get = [&](const char* key) {
    const auto found = config.find(key);
    if (found == config.end() || found->second.empty())
      throw UsageError("--resume " + resume + ": its configuration has no " + key + " (not a train_gpt checkpoint?)");
    return found->second;
  };
  if (config.contains("sync"))
    throw UsageError("--resume " + resume + ": a checkpoint of --sync " + config["sync"] +
                     " (each replica its own weights)");
  std::vector<std::string> args{"--resume",   resume,      "--layers", get("layers"), "--heads",
                                get("heads"), "--dim",     get("dim"), "--seq",       get("seq"),
                                "--seed",     get("seed"), "--arch",   get("model")};
  if (get("kv_heads") != "0") args.insert(args.end(), {"--kv-heads", get("kv_heads")});
  if (get("ffn") != "0") args.insert(args.end(), {"--ffn", get("ffn")});
  if (config.contains("experts"))
    args.insert(args.end(), {"--experts", get("experts"), "--moe-every", get("moe_every")});
  if (config.contains("dense_first")) args.insert(args.end(), {"--dense-first", get("dense_first")});
  return args;
}

/// The `generate` program's flags, turned into train_gpt's: the checkpoint's model flags first
/// (then the user's, which may not change them: the load compares), --generate 200 by default,
/// no training steps.
Options parse_generate(int argc, char** argv, bool cuda_build) {
  if (examples::help_requested(argc, argv)) {
    std::cout << generate_usage();
    std::exit(0);
  }
  std::vector<std::string> args{argv[0], "--generate", "200"}, user;
  std::string resume;
  std::optional<std::string> seed;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    for (const char* training :
         {"--steps", "--save-every", "--save-dir", "--eval-every", "--kfold", "--sync", "--export"})
      if (a == training) throw UsageError(a + " is a training flag (train_gpt's): generate trains nothing");
    if (a == "--dtype")
      throw UsageError("--dtype: generate computes in float (the checkpoint's master weights are fp32)");
    if (a == "--device" && !cuda_build)
      throw UsageError(
          "--device: this generate program runs on the CPU; a CUDA build's generate_cuda takes --device cuda");
    if ((a == "--resume" || a == "--seed") && i + 1 < argc) {
      (a == "--resume" ? resume : seed.emplace()) = examples::nonempty_flag_value(a, argv[++i]);
      continue;
    }
    user.push_back(a);
  }
  if (!resume.empty()) {
    const auto model = model_flags_of(resume);
    args.insert(args.end(), model.begin(), model.end());
  } else if (seed) {
    args.insert(args.end(), {"--seed", *seed});  // --init-from: the model's own seed does not matter
  }
  // generate_cuda holds only the GPU's instantiations of the trainer (train/run_flags.hpp): the GPU
  // is its default, as the CPU is generate's.
  if (cuda_build && std::find(user.begin(), user.end(), "--device") == user.end())
    args.insert(args.end(), {"--device", "cuda"});
  args.insert(args.end(), user.begin(), user.end());
  std::vector<char*> pointers;
  for (auto& a : args) pointers.push_back(a.data());
  Options o = parse(int(pointers.size()), pointers.data(), cuda_build);
  if (o.resume.empty() && o.init_from.empty())
    throw UsageError(
        "generate needs --resume DIR (a train_gpt checkpoint) or --init-from FILE.safetensors with the model's flags");
  if (seed) o.sampling_seed = examples::flag_value<std::uint64_t>("--seed", *seed, 0);  // "abc", "-1": usage errors
  o.generate_program = true;
  o.steps = 0;
  return o;
}

}  // namespace

int generate_main(int argc, char** argv, RunFn run_f32, bool cuda_build) {
  return main(argc, argv, cuda_build, run_f32, run_f32, parse_generate, cuda_build ? "generate_cuda" : "generate",
              generate_usage);
}

}  // namespace examples::gpt
