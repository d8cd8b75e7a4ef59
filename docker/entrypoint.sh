#!/bin/sh
# Entrypoint of the tuner images: runs its arguments (a `tuner ...` command line).
#
# `tuner worker` takes its token from --token or TUNER_TOKEN. When neither is given and
# TUNER_TOKEN_FILE names a file (the compose fleet's shared worker token, or a Docker
# secret), the token is read from there, waiting up to TUNER_TOKEN_WAIT seconds (120)
# for the file to appear.
set -eu

if [ -z "${TUNER_TOKEN:-}" ] && [ -n "${TUNER_TOKEN_FILE:-}" ]; then
    waited=0
    while [ ! -s "$TUNER_TOKEN_FILE" ]; do
        if [ "$waited" -ge "${TUNER_TOKEN_WAIT:-120}" ]; then
            echo "tuner-entrypoint: no token in $TUNER_TOKEN_FILE after ${waited}s;" \
                 "set TUNER_WORKER_TOKEN (tuner token create --role worker)" >&2
            exit 1
        fi
        sleep 2
        waited=$((waited + 2))
    done
    TUNER_TOKEN=$(cat "$TUNER_TOKEN_FILE")
    export TUNER_TOKEN
fi

exec "$@"
