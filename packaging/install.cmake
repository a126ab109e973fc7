# install.cmake: the part of `cmake --install` (and of CPack's staging) that
# depends on the prefix the files go to, which is known only then
# (packaging/packaging.cmake includes it with install(SCRIPT)). It writes
# the systemd unit with the binary's and the configuration's real paths and
# installs it, its sysusers.d entry and example.conf.
#
# Set before it runs: ST_PKG_SOURCE_DIR (packaging/ of the sources),
# ST_PKG_BINARY_DIR (packaging/ of the build), ST_PKG_BINDIR (bin, relative).
# CMAKE_INSTALL_PREFIX is the prefix of this install; file(INSTALL) adds
# DESTDIR itself and records each file in install_manifest.txt.

# Debian's rule, as GNUInstallDirs': the prefix /usr keeps its
# configuration in /etc; any other prefix in PREFIX/etc.
if(CMAKE_INSTALL_PREFIX STREQUAL "/usr")
  set(ST_SYSCONFDIR /etc)
else()
  set(ST_SYSCONFDIR ${CMAKE_INSTALL_PREFIX}/etc)
endif()
set(ST_BINDIR ${CMAKE_INSTALL_PREFIX}/${ST_PKG_BINDIR})

# One directory per destination (removed once installed), so that installs
# to different prefixes from the same build at once never write each
# other's unit.
string(MD5 st_where "$ENV{DESTDIR}|${CMAKE_INSTALL_PREFIX}")
set(st_unit_dir ${ST_PKG_BINARY_DIR}/unit-${st_where})
configure_file(${ST_PKG_SOURCE_DIR}/systemd/starling@.service.in
               ${st_unit_dir}/starling@.service @ONLY)

file(INSTALL DESTINATION ${CMAKE_INSTALL_PREFIX}/lib/systemd/system
     TYPE FILE FILES ${st_unit_dir}/starling@.service)
file(REMOVE_RECURSE ${st_unit_dir})
file(INSTALL DESTINATION ${CMAKE_INSTALL_PREFIX}/lib/sysusers.d
     TYPE FILE RENAME starling.conf
     FILES ${ST_PKG_SOURCE_DIR}/systemd/starling.sysusers)
file(INSTALL DESTINATION ${ST_SYSCONFDIR}/starling
     TYPE FILE FILES ${ST_PKG_SOURCE_DIR}/systemd/example.conf)
