#!/bin/sh
# Every public header compiles on its own, as C99 and C11 with -pedantic,
# and as C++, with warnings as errors.
set -eu
srcdir=${srcdir:-.}
cc=${CC:-cc}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
status=0
for h in "$srcdir"/wsd/*.h; do
	name=wsd/$(basename "$h")
	printf '#include <%s>\nint main(void) { return 0; }\n' "$name" > "$tmp/t.c"
	for std in c99 c11; do
		if ! $cc -std=$std -pedantic -Wall -Wextra -Werror -I"$srcdir" -c "$tmp/t.c" -o "$tmp/t.o"; then
			echo "FAIL: $name does not compile alone with -std=$std -pedantic"
			status=1
		fi
	done
	if command -v c++ >/dev/null 2>&1; then
		cp "$tmp/t.c" "$tmp/t.cc"
		c++ -std=c++11 -pedantic -Wall -Wextra -Werror -I"$srcdir" -c "$tmp/t.cc" -o "$tmp/t.o" ||
			{ echo "FAIL: $name does not compile as C++"; status=1; }
	fi
	[ $status -eq 0 ] && echo "ok: $name"
done
exit $status
