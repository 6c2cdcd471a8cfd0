// The step line and the progress bar: the ETA of any number of steps (issue 19, case 12: 10^18
// steps printed "ETA -2147483648h-8m").
#include "train/metrics.h"

#include <doctest/doctest.h>

using fsdp::train::progress_bar;

TEST_CASE("the ETA is in days for long runs and never overflows") {
  // 1 step of 10^18 took 2 s: far beyond any machine's life.
  const std::string huge = progress_bar(1, 1000000000000000000LL, 1.5, 2.0);
  CHECK(huge.find("ETA over 100000 days") != std::string::npos);
  CHECK(huge.find('-', huge.find("] ")) == std::string::npos);  // no negative numbers after the bar
  CHECK(huge.find("  0% step 1/1000000000000000000") != std::string::npos);
  // 1 of 100000 steps in 3 s: 299,997 s left = 3 days 11 hours.
  CHECK(progress_bar(1, 100000, 1.5, 3.0).find("ETA 3d11h") != std::string::npos);
  CHECK(progress_bar(10, 100, 1.5, 60.0).find("ETA 9m00s") != std::string::npos);
  CHECK(progress_bar(50, 100, 1.5, 10.0).find("[##########----------]  50%") != std::string::npos);
  fsdp::train::StepMetrics m;
  m.step = 2;
  m.steps = 9000000000000000000LL;
  m.elapsed_s = 1;
  m.step_time_s = 0.5;
  CHECK(fsdp::train::format_metrics(m).find("ETA over 100000 days") != std::string::npos);
}

// Issue 63: a run resumed at step 500 of 1000 that took 10 s for its first 10 steps has 490 s left,
// not the 9.6 s that counting the earlier launch's 500 steps as this one's gives.
TEST_CASE("after a resume the ETA counts this launch's steps") {
  CHECK(progress_bar(510, 1000, 1.5, 10.0, 500).find("ETA 8m10s") != std::string::npos);
  fsdp::train::StepMetrics m;
  m.step = 510;
  m.steps = 1000;
  m.elapsed_s = 10;
  m.resumed_from = 500;
  CHECK(fsdp::train::format_metrics(m).find("ETA 8m10s") != std::string::npos);
  m.resumed_from = 0;
  CHECK(fsdp::train::format_metrics(m).find("ETA 10s") != std::string::npos);  // what it said before
}

TEST_CASE("a dist_timeout under two steps is warned about on a GPU, where steps are queued ahead") {
  using fsdp::train::dist_timeout_warning;
  const std::string w = dist_timeout_warning(40.0, 60.0, /*queued_ahead=*/true);
  CHECK(w.find("a step takes 40.0 s and dist_timeout is 60.0 s") != std::string::npos);
  CHECK(w.find("Raise dist_timeout (--dist_timeout) above 120 s") != std::string::npos);
  CHECK(dist_timeout_warning(20.0, 60.0, true).empty());
  CHECK(dist_timeout_warning(40.0, 60.0, /*queued_ahead=*/false).empty());  // CPU: nothing queued ahead
}
