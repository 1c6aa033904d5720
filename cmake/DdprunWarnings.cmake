# Warnings and sanitizers for every ddprun target: ddprun_set_warnings(<target>).
function(ddprun_set_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow=local -Wno-missing-field-initializers>)
endfunction()

if(DDPRUN_SANITIZE)
  message(STATUS "ddprun: building with -fsanitize=${DDPRUN_SANITIZE}")
  add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-fsanitize=${DDPRUN_SANITIZE}> $<$<COMPILE_LANGUAGE:CXX>:-fno-omit-frame-pointer>)
  add_link_options(-fsanitize=${DDPRUN_SANITIZE})
endif()
