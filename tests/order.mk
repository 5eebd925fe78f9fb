# Read by GNU make when it runs, not by automake (Makefile.am includes it with
# "-include", which automake leaves alone), since automake would take a rule for a
# test's log as its own and drop the test's recipe.
#
# pkgconfig_check.sh's `make install` relinks libwsd-preload.so and libwsd-hooks.so,
# and libtool moves the build's own copies in .libs/ aside meanwhile: a test beside
# it that runs `wsd run` finds no switch, or the one relinked for the staging root
# ("libwsd-preload.so not found", seen in bench_check under make -j2).  So it runs
# after every other test.
tests/pkgconfig_check.sh.log: $(filter-out tests/pkgconfig_check.sh.log,$(TEST_LOGS))
