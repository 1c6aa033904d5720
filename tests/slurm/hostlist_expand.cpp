// Test driver for hostlist.h: one expression per stdin line; prints "OK h1 h2 ..." or
// "ERR <message>" per line (tests/slurm/hostlist_vs_scontrol.py compares with scontrol).
#include <iostream>
#include <string>

#include "ddprun/launcher/hostlist.h"

int main() {
  std::string line;
  while (std::getline(std::cin, line)) {
    try {
      std::string out = "OK";
      for (const auto& h : ddprun::launcher::expand_hostlist(line)) out += " " + h;
      std::cout << out << "\n";
    } catch (const ddprun::launcher::HostlistError& e) {
      std::cout << "ERR " << e.what() << "\n";
    }
  }
  return 0;
}
