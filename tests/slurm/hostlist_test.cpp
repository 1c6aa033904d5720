#include <catch2/catch.hpp>

#include "ddprun/launcher/hostlist.h"

using namespace ddprun::launcher;
using Hosts = std::vector<std::string>;

namespace {

std::string error_of(const std::string& expr) {
  try {
    expand_hostlist(expr);
  } catch (const HostlistError& e) {
    return e.what();
  }
  FAIL("'" << expr << "' was accepted");
  return "";
}

}  // namespace

TEST_CASE("hostlist: ranges, lists, suffixes and several bracket groups in one expression", "[hostlist]") {
  CHECK(expand_hostlist("gpu[01-04,07],cpu3,n[001-003]x,a-[1-2]-b[3,5]") ==
        Hosts{"gpu01", "gpu02", "gpu03", "gpu04", "gpu07", "cpu3", "n001x", "n002x", "n003x", "a-1-b3",
              "a-1-b5", "a-2-b3", "a-2-b5"});
}

TEST_CASE("hostlist: plain names, separators and empty items", "[hostlist]") {
  CHECK(expand_hostlist("n1") == Hosts{"n1"});
  CHECK(expand_hostlist("") == Hosts{});
  CHECK(expand_hostlist(" n1 , n2\tn3\n") == Hosts{"n1", "n2", "n3"});
  CHECK(expand_hostlist(",n1,,n2,") == Hosts{"n1", "n2"});
  CHECK(expand_hostlist("n-1,a.b.c") == Hosts{"n-1", "a.b.c"});
  CHECK(expand_hostlist("n1,n1") == Hosts{"n1", "n1"});  // duplicates kept, as scontrol does
}

TEST_CASE("hostlist: zero padding follows the lower bound as written", "[hostlist]") {
  CHECK(expand_hostlist("n[9-11]") == Hosts{"n9", "n10", "n11"});
  CHECK(expand_hostlist("n[09-11]") == Hosts{"n09", "n10", "n11"});
  CHECK(expand_hostlist("n[01-2]") == Hosts{"n01", "n02"});
  CHECK(expand_hostlist("n[1-02]") == Hosts{"n1", "n2"});
  CHECK(expand_hostlist("n[007]") == Hosts{"n007"});
  CHECK(expand_hostlist("n[98-101]") == Hosts{"n98", "n99", "n100", "n101"});
  CHECK(expand_hostlist("n[0-0]") == Hosts{"n0"});
  CHECK(expand_hostlist("n[99999999999]") == Hosts{"n99999999999"});
}

TEST_CASE("hostlist: commas inside brackets, order and duplicates kept", "[hostlist]") {
  CHECK(expand_hostlist("n[1-3,2]") == Hosts{"n1", "n2", "n3", "n2"});
  CHECK(expand_hostlist("n[5,1-2],m[3-4]") == Hosts{"n5", "n1", "n2", "m3", "m4"});
  CHECK(expand_hostlist("[1-2]") == Hosts{"1", "2"});
}

TEST_CASE("hostlist: several bracket groups are a cartesian product in Slurm's order", "[hostlist]") {
  CHECK(expand_hostlist("n[1-2][3-4]") == Hosts{"n13", "n14", "n23", "n24"});
  CHECK(expand_hostlist("rack[1-2]-node[001-002]") ==
        Hosts{"rack1-node001", "rack1-node002", "rack2-node001", "rack2-node002"});
  CHECK(expand_hostlist("r[1,3]c[1-2,5]x") ==
        Hosts{"r1c1x", "r1c2x", "r1c5x", "r3c1x", "r3c2x", "r3c5x"});
  CHECK(expand_hostlist("x[1-2]y[3-4]z") == Hosts{"x1y3z", "x1y4z", "x2y3z", "x2y4z"});
  // Three or more: the last fastest, then the first, ..., the second-to-last slowest (as
  // scontrol 22.05 expands them: its parser nests from the right).
  CHECK(expand_hostlist("r[1-2]-[1-2]-g[1-2]") == Hosts{"r1-1-g1", "r1-1-g2", "r2-1-g1", "r2-1-g2", "r1-2-g1",
                                                        "r1-2-g2", "r2-2-g1", "r2-2-g2"});
  CHECK(expand_hostlist("a[1-2]b[1-2]c[1-2]d[1,2]") ==
        Hosts{"a1b1c1d1", "a1b1c1d2", "a2b1c1d1", "a2b1c1d2", "a1b2c1d1", "a1b2c1d2", "a2b2c1d1", "a2b2c1d2",
              "a1b1c2d1", "a1b1c2d2", "a2b1c2d1", "a2b1c2d2", "a1b2c2d1", "a1b2c2d2", "a2b2c2d1", "a2b2c2d2"});
}

TEST_CASE("hostlist: first_host", "[hostlist]") {
  CHECK(first_host("gpu[07-09],a") == "gpu07");
  CHECK(first_host(" ,b[2-3]") == "b2");
  CHECK_THROWS_AS(first_host(""), HostlistError);
  CHECK_THROWS_AS(first_host("n[1-2"), HostlistError);  // validated as a whole
  CHECK_THROWS_AS(first_host("a,n[1-2"), HostlistError);
  CHECK_THROWS_AS(first_host("a,n[0-9999][0-9999]"), HostlistError);  // and bounded as a whole
  CHECK(first_host("n[0-65535][0-15]") == "n00");  // a million names, only one built
}

TEST_CASE("hostlist: malformed expressions get an error naming the place", "[hostlist]") {
  CHECK_THAT(error_of("n[1-2"), Catch::Contains("'[' is never closed") && Catch::Contains("position 1"));
  CHECK_THAT(error_of("n]1"), Catch::Contains("']' without a matching '['"));
  CHECK_THAT(error_of("n[[1]]"), Catch::Contains("do not nest"));
  CHECK_THAT(error_of("n[1-2]]"), Catch::Contains("']' without"));
  CHECK_THAT(error_of("n[]"), Catch::Contains("must start with a number"));
  CHECK_THAT(error_of("n[1-2,]"), Catch::Contains("must start with a number"));
  CHECK_THAT(error_of("n[,1]"), Catch::Contains("must start with a number"));
  CHECK_THAT(error_of("n[1-]"), Catch::Contains("needs a number after '-'"));
  CHECK_THAT(error_of("n[-1]"), Catch::Contains("must start with a number"));
  CHECK_THAT(error_of("n[1--2]"), Catch::Contains("needs a number after '-'"));
  CHECK_THAT(error_of("n[a-b]"), Catch::Contains("must start with a number"));
  CHECK_THAT(error_of("n[1-2 ]"), Catch::Contains("unexpected ' '"));
  CHECK_THAT(error_of("n[ 1-2]"), Catch::Contains("must start with a number"));
  CHECK_THAT(error_of("n[+1]"), Catch::Contains("must start with a number"));
  CHECK_THAT(error_of("n[5-3]"), Catch::Contains("runs backwards"));
  CHECK_THAT(error_of("n[010-8]"), Catch::Contains("runs backwards"));
  CHECK_THAT(error_of("n[99999999999999999999]"), Catch::Contains("too large"));
  // The user can always step around a nodelist ddprun cannot read.
  CHECK_THAT(error_of("n["), Catch::Contains("--no_slurm"));
}

TEST_CASE("hostlist: expansion is bounded", "[hostlist]") {
  CHECK(expand_hostlist("n[0-65535]").size() == 65536);
  CHECK_THAT(error_of("n[0-65536]"), Catch::Contains("more than 65536 hosts"));
  CHECK_THAT(error_of("n[0-99999]"), Catch::Contains("more than 65536 hosts"));
  // Each range is allowed, the product is not.
  CHECK_THAT(error_of("n[0-9999][0-9999]"), Catch::Contains("more than 1048576 hosts"));
  // Nor many items together.
  std::string many;
  for (int i = 0; i < 17; ++i) many += "r" + std::to_string(i) + "n[0-65535],";
  CHECK_THAT(error_of(many), Catch::Contains("more than 1048576 hosts"));
}
