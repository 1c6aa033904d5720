// Test helper: starts a program with this process's environment plus `extra_env` ("K=V"
// entries replace inherited ones of the same name), stdout and stderr into `out_path`.
#pragma once

#include <fcntl.h>
#include <spawn.h>
#include <unistd.h>

#include <string>
#include <system_error>
#include <vector>

extern char** environ;

namespace ddprun::worker::testing {

inline pid_t spawn_logged(const std::vector<std::string>& args, const std::vector<std::string>& extra_env,
                          const std::string& out_path) {
  std::vector<std::string> env_s;
  for (char** e = environ; *e; ++e) {
    std::string s = *e;
    bool overridden = false;
    for (const auto& x : extra_env) overridden |= s.compare(0, x.find('=') + 1, x, 0, x.find('=') + 1) == 0;
    if (!overridden) env_s.push_back(s);
  }
  env_s.insert(env_s.end(), extra_env.begin(), extra_env.end());
  std::vector<char*> argv, envp;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (const auto& e : env_s) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) throw std::system_error(rc, std::generic_category(), "posix_spawn " + args[0]);
  return pid;
}

}  // namespace ddprun::worker::testing
