# Warnings and sanitizers for every ddprun target: ddprun_set_warnings(<target>).
function(ddprun_set_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wno-missing-field-initializers>
    # clang (the fuzz build) spells GCC's -Wshadow=local differently.
    $<$<COMPILE_LANG_AND_ID:CXX,GNU>:-Wshadow=local>
    $<$<COMPILE_LANG_AND_ID:CXX,Clang>:-Wshadow-uncaptured-local>)
endfunction()

option(DDPRUN_FUZZ "Build the libFuzzer targets of tests/fuzz (clang only; implies address,undefined)" OFF)

if(DDPRUN_FUZZ)
  # Every library is instrumented for coverage; only the fuzz binaries link libFuzzer's main.
  set(DDPRUN_SANITIZE "address,undefined" CACHE STRING "" FORCE)
  add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-fsanitize=fuzzer-no-link>)
endif()

if(DDPRUN_SANITIZE)
  message(STATUS "ddprun: building with -fsanitize=${DDPRUN_SANITIZE}")
  add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-fsanitize=${DDPRUN_SANITIZE}> $<$<COMPILE_LANGUAGE:CXX>:-fno-omit-frame-pointer>)
  add_link_options(-fsanitize=${DDPRUN_SANITIZE})
  if(DDPRUN_SANITIZE MATCHES "thread")
    # Asio's fenced blocks use atomic_thread_fence, which TSan does not model; GCC warns about
    # each instantiation (-Wtsan). Known and accepted: the TSan stage reports races, not this.
    add_compile_options($<$<COMPILE_LANG_AND_ID:CXX,GNU>:-Wno-tsan>)
  endif()
  if(DDPRUN_SANITIZE MATCHES "undefined")
    # A UBSan report fails the test (or the fuzz run) instead of scrolling past.
    add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-fno-sanitize-recover=undefined>)
    add_link_options(-fno-sanitize-recover=undefined)
  endif()
endif()
