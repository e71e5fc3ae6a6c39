# Installation of the three layers: headers, static and shared libraries, one
# pkg-config file per library and a CMake package with kittykv::kittykv,
# kittykv::model and kittykv::eval (static; *_shared for the shared ones).
include(CMakePackageConfigHelpers)

install(FILES ${KKV_INC}/kittykv.h ${KKV_INC}/kittykv_cpu.h ${KKV_INC}/kittykv_model.h
              ${KKV_INC}/kittykv_eval.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS kittykv kittykv_shared kittykv_model kittykv_model_shared
                kittykv_eval kittykv_eval_shared
        EXPORT kittykvTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS kittykv_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(EXPORT kittykvTargets NAMESPACE kittykv::
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/kittykv)

configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/kittykvConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/kittykvConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/kittykv)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/kittykvConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/kittykvConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/kittykvConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/kittykv)

# pkg-config: shared linking by default, `--static` adds the private libraries.
foreach(pc kittykv kittykv-model kittykv-eval)
  configure_file(${CMAKE_CURRENT_LIST_DIR}/${pc}.pc.in ${CMAKE_CURRENT_BINARY_DIR}/${pc}.pc @ONLY)
  install(FILES ${CMAKE_CURRENT_BINARY_DIR}/${pc}.pc
          DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
endforeach()
