// train's command line (train_flags.cpp): every flag fills a field of Options.
#pragma once

#include "train_common.h"

namespace CLI {
class App;
}

namespace train {
void add_flags(CLI::App& app, Options& o);
}  // namespace train
