# The programs' version.

# ---- --version -----------------------------------------------------------------------------
if(TARGET ddprun_launcher_core)
  target_compile_definitions(ddprun_launcher_core PRIVATE DDPRUN_VERSION="${PROJECT_VERSION}")
endif()
target_compile_definitions(ddprund PRIVATE DDPRUN_VERSION="${PROJECT_VERSION}")
