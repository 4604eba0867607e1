// `tandem tp-worker --rank R [serve options]`: one tensor-parallel worker rank. The head
// (`tandem serve --tensor-parallel-size N`) starts these itself by re-executing its own binary with
// its own options; on other nodes `tandem serve --nnodes N --node-rank R` starts them. Not meant to
// be run by hand, but harmless: it connects to --master-addr/--master-port and waits for plans.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cli/command.h"
#include "engine/parallel/tp_runner.h"
#include "server/options.h"

namespace {

int run_tp_worker(int argc, char** argv) {
  using namespace tandem;
  std::vector<std::string> args;
  int rank = -1;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--rank" && i + 1 < argc) {
      rank = std::atoi(argv[++i]);
      continue;
    }
    args.push_back(a);
  }
  if (rank < 1) {
    std::fprintf(stderr, "tandem tp-worker: --rank R (>= 1) is required\n");
    return 2;
  }
  auto opts = server::parse_serve_options(args, [](const std::string&) -> std::optional<std::string> {
    return std::nullopt;  // a worker takes its options from its command line only, as the head wrote it
  });
  if (!opts.ok()) {
    std::fprintf(stderr, "tandem tp-worker: %s\n", opts.status().message().c_str());
    return 2;
  }
  return run_tp_worker_process(opts->engine, rank);
}

}  // namespace

TANDEM_REGISTER_COMMAND(tp_worker, "tp-worker", "one tensor-parallel worker rank (started by tandem serve)",
                        run_tp_worker);
