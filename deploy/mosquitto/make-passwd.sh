#!/bin/sh
# Write Mosquitto's password file for the users of the ACL (agent, device, monitor, operator) from the
# environment, hashed by mosquitto_passwd. Run by the compose stack's mosquitto-init service
# (so no password, not even a hash, lives in the repository) and by the deploy tests.
#
# usage: make-passwd.sh FILE
# environment: MQTT_AGENT_PASSWORD, MQTT_DEVICE_PASSWORD, MQTT_MONITOR_PASSWORD,
# MQTT_OPERATOR_PASSWORD (all required)
set -eu

file="${1:?usage: make-passwd.sh FILE}"
: "${MQTT_AGENT_PASSWORD:?set MQTT_AGENT_PASSWORD}"
: "${MQTT_DEVICE_PASSWORD:?set MQTT_DEVICE_PASSWORD}"
: "${MQTT_MONITOR_PASSWORD:?set MQTT_MONITOR_PASSWORD}"
: "${MQTT_OPERATOR_PASSWORD:?set MQTT_OPERATOR_PASSWORD}"

umask 077
tmp="$file.tmp"
: > "$tmp"
mosquitto_passwd -b "$tmp" agent "$MQTT_AGENT_PASSWORD"
mosquitto_passwd -b "$tmp" device "$MQTT_DEVICE_PASSWORD"
mosquitto_passwd -b "$tmp" monitor "$MQTT_MONITOR_PASSWORD"
mosquitto_passwd -b "$tmp" operator "$MQTT_OPERATOR_PASSWORD"
# Mosquitto drops to its own user (uid 1883 in the eclipse-mosquitto image) before reading it.
if [ -n "${MQTT_PASSWD_OWNER:-}" ]; then
  chown "$MQTT_PASSWD_OWNER" "$tmp"
fi
mv "$tmp" "$file"
echo "wrote $file: agent, device, monitor, operator"
