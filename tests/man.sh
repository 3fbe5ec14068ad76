#!/bin/sh
# The man pages (am/man.am): each renders with groff (or man -l) without a
# warning; rankmem(7) lists every option `rankmem-info -c` prints; each
# tool's page names every option its --help prints. Run by make check from
# the top of the build tree ($srcdir is set by automake).
: "${srcdir:=.}"
# Set by the .sh tests' driver for another test: not an option of ours.
unset RANKMEM_REPLAY
# Under AddressSanitizer: a tool's --help is not the place to hunt leaks.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
n=0
ok() { n=$((n + 1)); echo "ok $n - $*"; }
not_ok() { n=$((n + 1)); echo "not ok $n - $*"; }
skip() { n=$((n + 1)); echo "ok $n # SKIP $*"; }
tmp=${TMPDIR:-/tmp}/rankmem-man.$$
mkdir -p "$tmp" || exit 1
trap 'rm -rf "$tmp"' EXIT

# A page as built here, or as shipped in the source tree (a release).
page() {
    if [ -f "man/$1" ]; then echo "man/$1"; elif [ -f "$srcdir/man/$1" ]; then echo "$srcdir/man/$1"; fi
}
pages=$(cd "$srcdir/man" && ls ./*.md | sed -n 's|^\./\(.*\)\.md$|\1|p' | grep -v '^README$')
[ -n "$pages" ] || { echo "1..0 # SKIP no man page sources in $srcdir/man"; exit 0; }

# Plain text of a page (for the option checks). groff only: man(1) without
# groff installed prints the roff source, which proves nothing.
render() {
    groff -man -Tascii -P-c -P-b -P-u "$1" 2>/dev/null
}

for p in $pages; do
    f=$(page "$p")
    if [ -z "$f" ]; then
        not_ok "$p: not built (make $p)"
        continue
    fi
    if command -v groff >/dev/null 2>&1; then
        groff -man -Tutf8 -ww -z "$f" >"$tmp/warn" 2>&1
        if [ -s "$tmp/warn" ]; then
            not_ok "$p renders without warnings (groff -man -ww)"
            sed 's/^/#   /' "$tmp/warn"
        else
            ok "$p renders without warnings (groff -man -ww)"
        fi
    else
        skip "$p: no groff to render it"
        continue
    fi
    render "$f" >"$tmp/$p.txt"
    head -n 8 "$tmp/$p.txt" | grep -q "^NAME" && grep -q "^SEE ALSO" "$tmp/$p.txt"
    if [ $? -eq 0 ]; then ok "$p has NAME and SEE ALSO sections"; else not_ok "$p has NAME and SEE ALSO sections"; fi
done

# rankmem(7) and rankmem-info -c: the same set of RANKMEM_* variables.
info=./tools/rankmem-info
if [ -x "$info" ] && [ -s "$tmp/rankmem.7.txt" ]; then
    RANKMEM_QUIET=1 "$info" -c 2>/dev/null | sed -n 's/^\(RANKMEM_[A-Z0-9_]*\) .*/\1/p' | sort -u >"$tmp/opts"
    missing=
    for o in $(cat "$tmp/opts"); do
        grep -q "^ *$o\$" "$tmp/rankmem.7.txt" || missing="$missing $o"
    done
    if [ ! -s "$tmp/opts" ]; then
        not_ok "rankmem-info -c printed no option"
    elif [ -n "$missing" ]; then
        not_ok "rankmem(7) documents every option of rankmem-info -c; missing:$missing"
    else
        ok "rankmem(7) documents all $(wc -l <"$tmp/opts") options of rankmem-info -c"
    fi
    # ... and no variable that the library does not have.
    extra=
    for o in $(sed -n 's/^       \(RANKMEM_[A-Z0-9_]*\)$/\1/p' "$tmp/rankmem.7.txt"); do
        grep -qx "$o" "$tmp/opts" || extra="$extra $o"
    done
    if [ -n "$extra" ]; then not_ok "rankmem(7) lists only real options; unknown:$extra"; else ok "rankmem(7) lists only options rankmem-info knows"; fi
else
    skip "no tools/rankmem-info or no rendered rankmem.7 to compare"
fi

# Each tool's options (from its --help) in its page.
for t in tools/rankmem-info bench/rankmem-replay tools/rankmem-report; do
    name=${t##*/}
    txt=$tmp/$name.1.txt
    if [ ! -x "./$t" ]; then skip "$name is not built"; continue; fi
    if [ ! -s "$txt" ]; then skip "no rendered $name(1)"; continue; fi
    "./$t" --help 2>&1 | grep -o -- '--[a-z][a-z-]*\|^ *-[a-z]\b' | sed 's/^ *//' | sort -u >"$tmp/$name.opts"
    missing=
    for o in $(cat "$tmp/$name.opts"); do
        grep -q -- "$o" "$txt" || missing="$missing $o"
    done
    if [ ! -s "$tmp/$name.opts" ]; then
        not_ok "$name --help names no option"
    elif [ -n "$missing" ]; then
        not_ok "$name(1) documents every option of $name --help; missing:$missing"
    else
        ok "$name(1) documents all $(wc -l <"$tmp/$name.opts") options of $name --help"
    fi
done
echo "1..$n"
