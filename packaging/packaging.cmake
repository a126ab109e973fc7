# packaging.cmake: what `cmake --install` puts in place beyond the client
# library and the Python package (CMakeLists.txt, client/), and the Debian
# package CPack makes of it (`cpack -G DEB` in the build directory, or
# `cmake --build BUILD --target package`). Included at the end of
# CMakeLists.txt; docs/operations.md, "Installing", says how to use it.
#
#   bin/starling                         the binary
#   share/man/man1/starling*.1           man pages made from the --help texts
#   lib/systemd/system/starling@.service the unit (packaging/systemd/)
#   lib/sysusers.d/starling.conf         its user, `starling`
#   ETC/starling/example.conf            an instance's settings
#   share/doc/starling/                  README, docs/, examples/client.c
#   LIBDIR/starling/libstarling_cuda.so  the CUDA module, when built, with
#                                        --component cuda only (not in the .deb)
#
# ETC is /etc for the prefix /usr and PREFIX/etc otherwise, decided when the
# files are installed (packaging/install.cmake), so that `cmake --install
# --prefix DIR` and CPack's staging get the paths right.

install(TARGETS starling RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
if(TARGET starling_cuda)
  # Only when asked for (`cmake --install BUILD --component cuda`): it links
  # the CUDA toolkit's libraries, which the machines it goes to may not
  # have. Found through STARLING_CUDA_MODULE (example.conf;
  # kernels/cuda_module.c).
  install(TARGETS starling_cuda LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}/starling
          COMPONENT cuda EXCLUDE_FROM_ALL)
endif()

# Man pages, from the --help texts of the binary just built: starling.1 and
# one starling-CMD.1 per command (packaging/man/help2roff.py).
find_program(ST_PYTHON3 NAMES python3)
if(ST_PYTHON3)
  set(ST_MAN_DIR ${CMAKE_BINARY_DIR}/man)
  add_custom_command(OUTPUT ${ST_MAN_DIR}/starling.1
    COMMAND ${ST_PYTHON3} ${CMAKE_SOURCE_DIR}/packaging/man/help2roff.py
            --starling $<TARGET_FILE:starling> --out ${ST_MAN_DIR}
            --version ${PROJECT_VERSION}
    DEPENDS starling ${CMAKE_SOURCE_DIR}/packaging/man/help2roff.py
    COMMENT "Writing the man pages from starling --help")
  add_custom_target(starling_man ALL DEPENDS ${ST_MAN_DIR}/starling.1)
  install(DIRECTORY ${ST_MAN_DIR}/ DESTINATION ${CMAKE_INSTALL_MANDIR}/man1
          FILES_MATCHING PATTERN "*.1")
else()
  message(STATUS "starling: no python3, so no man pages")
endif()

install(FILES ${CMAKE_SOURCE_DIR}/README.md DESTINATION ${CMAKE_INSTALL_DOCDIR})
install(DIRECTORY ${CMAKE_SOURCE_DIR}/docs/ DESTINATION ${CMAKE_INSTALL_DOCDIR}
        FILES_MATCHING PATTERN "*.md")
install(FILES ${CMAKE_SOURCE_DIR}/examples/client.c
        DESTINATION ${CMAKE_INSTALL_DOCDIR}/examples)

# The unit (its paths follow the prefix), its sysusers.d entry and
# example.conf: at install time, by packaging/install.cmake.
install(CODE "set(ST_PKG_SOURCE_DIR \"${CMAKE_SOURCE_DIR}/packaging\")
set(ST_PKG_BINARY_DIR \"${CMAKE_BINARY_DIR}/packaging\")
set(ST_PKG_BINDIR \"${CMAKE_INSTALL_BINDIR}\")")
install(SCRIPT ${CMAKE_SOURCE_DIR}/packaging/install.cmake)

# ---- the Debian package --------------------------------------------------------
# Built from the tree `cmake --install` makes, at the configured prefix: for
# a package that follows Debian's layout, configure with
# -DCMAKE_INSTALL_PREFIX=/usr (and -DSTARLING_CUDA=OFF: the CUDA module links
# the CUDA toolkit, which no Debian 12 package provides, so the package
# leaves it out whatever the build). The runtime dependencies are the
# packages of the libraries the binary links (readelf -d; dpkg -S), by their
# Debian 12 names; tests/integration/test_deb.sh checks the two agree.
# python3 is for the Python package, whose import needs NumPy and PyTorch
# (recommended, with the data set the example configuration trains on).
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME starling)
set(CPACK_PACKAGE_VENDOR starling)
set(CPACK_PACKAGE_CONTACT "starling maintainers <starling@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "peer-to-peer training with local SGD and gossip averaging")
set(CPACK_DEBIAN_PACKAGE_DESCRIPTION
    "starling trains one model across peer machines: each node trains its
shard with local SGD and keeps its model close to its peers' by gossip
averaging and ring all-reduce over authenticated, encrypted links. This
package holds the starling command, the client library with its header
and pkg-config file, the Python package, man pages and the systemd unit
starling@.service.")
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION science)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_PACKAGE_DEPENDS
    "libc6 (>= 2.34), libuv1 (>= 1.44), libsodium23 (>= 1.0.18), libmsgpackc2 (>= 4.0), libjansson4 (>= 2.14), libopenblas0, liblapacke (>= 3.9), zlib1g (>= 1:1.2), libmicrohttpd12, python3 (>= 3.9)")
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS
    "python3-numpy, python3-torch, python3-matplotlib, dataset-fashion-mnist")
set(CPACK_DEBIAN_PACKAGE_SUGGESTS "systemd")
set(CPACK_DEBIAN_COMPRESSION_TYPE gzip)
set(CPACK_STRIP_FILES ON)
# Stage with DESTDIR at the real prefix, so that what the install code writes
# (the unit's paths, starling/_installed.py) names /usr, not the staging tree.
set(CPACK_SET_DESTDIR ON)
set(CPACK_PACKAGING_INSTALL_PREFIX ${CMAKE_INSTALL_PREFIX})
set(CPACK_INSTALL_PREFIX ${CMAKE_INSTALL_PREFIX})
# The maintainer scripts (user, systemd reload) and the conffile list.
if(CMAKE_INSTALL_PREFIX STREQUAL "/usr")
  set(ST_PKG_ETC /etc)
else()
  set(ST_PKG_ETC ${CMAKE_INSTALL_PREFIX}/etc)
endif()
file(WRITE ${CMAKE_BINARY_DIR}/packaging/deb/conffiles
     "${ST_PKG_ETC}/starling/example.conf\n")
foreach(script postinst prerm postrm)
  file(COPY ${CMAKE_SOURCE_DIR}/packaging/deb/${script}
       DESTINATION ${CMAKE_BINARY_DIR}/packaging/deb
       FILE_PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ
                        GROUP_EXECUTE WORLD_READ WORLD_EXECUTE)
endforeach()
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA
    ${CMAKE_BINARY_DIR}/packaging/deb/conffiles
    ${CMAKE_BINARY_DIR}/packaging/deb/postinst
    ${CMAKE_BINARY_DIR}/packaging/deb/prerm
    ${CMAKE_BINARY_DIR}/packaging/deb/postrm)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
include(CPack)
