// What a training run did, as run_training returns it (RunReport fills it in).
#pragma once

#include <cstdint>

namespace fsdp::train {

struct TrainSummary {
  int64_t steps = 0;  // the last step done (a resumed run counts from the checkpoint's)
  double first_loss = 0, last_loss = 0;
  double eval_loss = 0;  // NaN when nothing was held out
  double seconds = 0;
  double tokens_per_s = 0;
  int64_t resumed_from = 0;  // the step of the checkpoint this run continued (0: a fresh start)
  bool stopped = false;      // stopped early on a signal (StopSignals), with a checkpoint of `steps` saved
};

}  // namespace fsdp::train
