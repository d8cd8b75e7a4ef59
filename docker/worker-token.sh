#!/bin/sh
# tuner-worker-token FILE: make sure FILE holds a worker token for the compose fleet's
# own workers. Creates one (`tuner token create --role worker`; the database keeps only
# its SHA-256) when FILE is missing or empty; keeps the one there otherwise.
set -eu

file=${1:?usage: tuner-worker-token FILE}
if [ -s "$file" ]; then
    exit 0
fi
umask 077
out=$(tuner token create --role worker --name compose-workers)
printf '%s\n' "$out" | tail -n 1 > "$file.tmp"
mv "$file.tmp" "$file"
echo "tuner-worker-token: created a worker token for the compose workers in $file"
