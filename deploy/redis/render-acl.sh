#!/bin/sh
# Render a Redis ACL file from the committed template with real password hashes.
#
#   REDISBUS_AGENT_PASSWORD=... REDISBUS_EXPORTER_PASSWORD=... \
#       sh deploy/redis/render-acl.sh deploy/redis/users.acl OUT.acl
#
# The template (users.acl) holds placeholder hashes (64 zeros) that no password matches, so
# it loads, but nobody can log in until it is rendered. Redis stores SHA-256 hashes (#...),
# never the passwords; the rendered file is still a secret: keep it out of git.
# The default user needs no password: it is off and has none (`resetpass`), so nobody can
# log in as it; its permissions are for the server itself, which replays the append-only file
# as the default user on Redis 7 (see deploy/README.md). The script refuses a template whose
# default user could log in.
# POSIX sh and coreutils only, so it also runs inside the official redis image.
set -eu

template=${1:?usage: render-acl.sh TEMPLATE OUT}
out=${2:?usage: render-acl.sh TEMPLATE OUT}
: "${REDISBUS_AGENT_PASSWORD:?set REDISBUS_AGENT_PASSWORD}"
: "${REDISBUS_EXPORTER_PASSWORD:?set REDISBUS_EXPORTER_PASSWORD}"

sha() { printf '%s' "$1" | sha256sum | cut -d' ' -f1; }
agent=$(sha "$REDISBUS_AGENT_PASSWORD")
exporter=$(sha "$REDISBUS_EXPORTER_PASSWORD")

default_user=$(grep '^user default ' "$template" || true)
case " $default_user " in
    *" on "* | *" nopass "* | *" >"* | *" #"*) safe=no ;;
    *" off "*) case " $default_user " in *" resetpass "*) safe=yes ;; *) safe=no ;; esac ;;
    *) safe=no ;;
esac
if [ "$safe" != yes ]; then
    echo "render-acl: the default user of $template must be off, with resetpass and no" \
        "password (nobody may log in as it)" >&2
    exit 1
fi

umask 077
sed -e "s/^\(user agent on \)#0\{64\}/\1#$agent/" \
    -e "s/^\(user exporter on \)#0\{64\}/\1#$exporter/" \
    "$template" >"$out.tmp"
if grep -q '#0\{64\}' "$out.tmp"; then
    rm -f "$out.tmp"
    echo "render-acl: a placeholder hash is left in $out (unknown user line?)" >&2
    exit 1
fi
mv "$out.tmp" "$out"
