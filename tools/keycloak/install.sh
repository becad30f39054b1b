#!/usr/bin/env bash
# Keycloak, the dashboard's login test's OIDC issuer (tests/e2e/test_dashboard_oidc.py), once per machine
# into a version-stamped cache outside the repo: Maven Central's org.keycloak:keycloak-quarkus-dist zip
# fetched by Maven (through a throwaway local repository), unpacked, and built once for `start-dev` (its
# first start does that, about 80 s; a test's start then takes only its start).
# Keycloak 26 runs on Java 21 or later: the first JDK found that is (SKYSCAN_KEYCLOAK_JAVA_HOME, then
# /usr/lib/jvm/*) is recorded in the cache as `java-home`.
# Prints the Keycloak directory; fails, saying why, when it cannot be had.
set -euo pipefail

KEYCLOAK_VERSION=${KEYCLOAK_VERSION:-26.5.6}
DEPENDENCY_PLUGIN=org.apache.maven.plugins:maven-dependency-plugin:3.8.1
dir=${SKYSCAN_KEYCLOAK_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/skyscan/keycloak/$KEYCLOAK_VERSION}

java_version() { # the major version of JAVA_HOME $1's java, or nothing
  "$1/bin/java" -XshowSettings:properties -version 2>&1 | awk '/java.specification.version/ {print $3}'
}
java_home=""
for candidate in "${SKYSCAN_KEYCLOAK_JAVA_HOME:-}" /usr/lib/jvm/*; do
  [ -n "$candidate" ] && [ -x "$candidate/bin/java" ] || continue
  version=$(java_version "$candidate")
  if [ "${version%%.*}" -ge 21 ] 2>/dev/null; then java_home=$candidate; break; fi
done
if [ -z "$java_home" ]; then
  echo "no Java 21 or later for Keycloak $KEYCLOAK_VERSION (set SKYSCAN_KEYCLOAK_JAVA_HOME)" >&2
  exit 1
fi

if [ ! -x "$dir/bin/kc.sh" ]; then
  command -v mvn >/dev/null || { echo "mvn (Maven) is needed to fetch Keycloak" >&2; exit 1; }
  echo "fetching Keycloak $KEYCLOAK_VERSION into $dir" >&2
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  mvn -q -B -Dmaven.repo.local="$tmp/repository" "$DEPENDENCY_PLUGIN:copy" \
    -Dartifact="org.keycloak:keycloak-quarkus-dist:$KEYCLOAK_VERSION:zip" -DoutputDirectory="$tmp" >&2
  python3 -m zipfile -e "$tmp/keycloak-quarkus-dist-$KEYCLOAK_VERSION.zip" "$tmp/unpacked"
  chmod +x "$tmp/unpacked/keycloak-$KEYCLOAK_VERSION"/bin/*.sh  # zipfile keeps no modes
  mkdir -p "$(dirname "$dir")"
  rm -rf "$dir"
  mv "$tmp/unpacked/keycloak-$KEYCLOAK_VERSION" "$dir"
fi
echo "$java_home" > "$dir/java-home"

# start-dev builds the server for development mode at its first start, then starts it: done here once,
# on a free loopback port, stopped as soon as it listens (or after 600 s), its database removed.
if [ ! -e "$dir/built-for-dev" ]; then
  echo "building Keycloak $KEYCLOAK_VERSION for start-dev (once)" >&2
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  log=$(mktemp)
  JAVA_HOME=$java_home "$dir/bin/kc.sh" start-dev --http-host 127.0.0.1 --http-port "$port" >"$log" 2>&1 &
  pid=$!
  deadline=$((SECONDS + 600))
  until grep -q "Listening on" "$log"; do
    if ! kill -0 "$pid" 2>/dev/null || [ $SECONDS -ge $deadline ]; then
      kill "$pid" 2>/dev/null || true
      cat "$log" >&2
      echo "Keycloak $KEYCLOAK_VERSION did not start for its build" >&2
      exit 1
    fi
    sleep 1
  done
  kill "$pid"
  wait "$pid" || true
  rm -rf "$dir/data" "$log"
  touch "$dir/built-for-dev"
fi
echo "$dir"
