// Slurm hostlist expressions (SLURM_JOB_NODELIST, SLURM_STEP_NODELIST), expanded natively so
// that ddprun never needs `scontrol show hostnames` on a compute node. Pure.
//
// Syntax (what Slurm writes, and a little more):
//   list   := item { sep item }        sep: ',' or blanks outside brackets; empty items skipped
//   item   := { text | '[' ranges ']' } text: any bytes but '[', ']', ',' and blanks
//   ranges := range { ',' range }      range: DIGITS or DIGITS '-' DIGITS with lo <= hi
// A range is zero-padded to the width of its lower bound as written ("[09-11]" -> 09 10 11,
// "[9-11]" -> 9 10 11). Several bracket groups in one item expand as a cartesian product in
// Slurm's order: the last group varies fastest; before it, the first group, then the second, ...,
// and the second-to-last group varies slowest (two groups: "a-[1-2]-b[3,5]" -> a-1-b3 a-1-b5
// a-2-b3 a-2-b5; three: "r[1-2]-[1-2]-g[1-2]" -> r1-1-g1 r1-1-g2 r2-1-g1 r2-1-g2 r1-2-g1 ...).
// Order and duplicates are kept, as scontrol keeps them.
//
// Where this differs from Slurm 22.05's own parser (tests/slurm/hostlist_vs_scontrol.py pins
// both sides): text after the last bracket group ("n[001-003]x") is accepted here, while 22.05
// rejects it; forms that 22.05 accepts only by accident ("n[1-]", "n[+1]", "n[ 1-2]", "n]1", an
// unclosed '[') are errors here.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace ddprun::launcher {

// The expression does not parse, or expands past the limits below. The message quotes the
// expression and says what is wrong at which position.
class HostlistError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Slurm refuses a single range of more than 65536 hosts; so do we, and the whole expansion is
// capped too so that a hostile variable cannot make the launcher allocate without bound.
inline constexpr size_t kMaxHostsPerRange = 65536;
inline constexpr size_t kMaxHostlistHosts = 1 << 20;

// Every host name of `expr`, in order. Throws HostlistError.
std::vector<std::string> expand_hostlist(std::string_view expr);

// The first host of `expr` (the whole expression is still validated). Throws HostlistError,
// also when the expression names no host at all.
std::string first_host(std::string_view expr);

}  // namespace ddprun::launcher
