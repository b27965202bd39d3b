#!/usr/bin/env bash
# Print the newest CPython 3.11+ interpreter this machine has: python3.N on PATH, and pyenv's
# installed versions (whose shims refuse a version that is not selected). Empty when none.
set -u
best="" best_minor=0
consider() {
    local py=$1 minor
    minor=$("$py" -c 'import sys; print(sys.version_info[1] if sys.version_info[0] == 3 else 0)' 2>/dev/null) || return
    if [ -n "$minor" ] && [ "$minor" -ge 11 ] && [ "$minor" -gt "$best_minor" ]; then
        best=$py best_minor=$minor
    fi
}
for n in 11 12 13 14 15; do
    py=$(command -v "python3.$n" 2>/dev/null) && consider "$py"
done
if root=$(pyenv root 2>/dev/null); then
    for py in "$root"/versions/3.*/bin/python3; do
        [ -x "$py" ] && consider "$py"
    done
fi
[ -n "$best" ] && echo "$best"
