# Installation of the three layers: headers, static and shared libraries, one
# pkg-config file per library and a CMake package with kittykv::kittykv,
# kittykv::model and kittykv::eval (static; *_shared for the shared ones).
#
# Under scikit-build-core (`pip install .`, SKBUILD set) only the three shared
# libraries are installed, into the Python package's folder next to
# python/kittykv/*.py, which loads them with ctypes. They get no version suffix
# (a wheel is a zip: symlinks would become copies) and an $ORIGIN rpath, so
# libkittykv-eval.so finds libkittykv-model.so and libkittykv.so beside it.
if(SKBUILD)
  set(KKV_PY_LIBS kittykv_shared kittykv_model_shared kittykv_eval_shared)
  foreach(t ${KKV_PY_LIBS})
    set_property(TARGET ${t} PROPERTY VERSION)
    set_property(TARGET ${t} PROPERTY SOVERSION)
    set_target_properties(${t} PROPERTIES INSTALL_RPATH "$ORIGIN")
  endforeach()
  install(TARGETS ${KKV_PY_LIBS}
          LIBRARY DESTINATION ${SKBUILD_PLATLIB_DIR}/kittykv COMPONENT python
          RUNTIME DESTINATION ${SKBUILD_PLATLIB_DIR}/kittykv COMPONENT python)
  return()
endif()

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
if(TARGET kittykv_cli)
  install(TARGETS kittykv_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()
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
