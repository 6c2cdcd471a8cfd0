// See README.md: only the names ProcessGroupGloo.hpp needs.
#pragma once
