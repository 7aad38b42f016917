#!/bin/sh
# Write Mosquitto's password file for the users of the ACL from the environment, hashed by
# mosquitto_passwd: the agent, the monitor, the operator (the fleet's control plane), and the devices, each under its own device id (the
# ACL's %u patterns let a device publish only as itself). Run by the compose stack's
# mosquitto-init service (so no password, not even a hash, lives in the repository) and by the
# tests.
#
# usage: make-passwd.sh FILE
# environment:
#   MQTT_AGENT_PASSWORD, MQTT_MONITOR_PASSWORD,   (required)
#   MQTT_OPERATOR_PASSWORD                        (required) the control plane's login
#   MQTT_DEVICE_USER, MQTT_DEVICE_PASSWORD        (required) one device: its id and password
#   MQTT_DEVICES_FILE                             (optional) more devices, one "ID PASSWORD"
#                                                 per line ('#' starts a comment)
set -eu

file="${1:?usage: make-passwd.sh FILE}"
: "${MQTT_AGENT_PASSWORD:?set MQTT_AGENT_PASSWORD}"
: "${MQTT_MONITOR_PASSWORD:?set MQTT_MONITOR_PASSWORD}"
: "${MQTT_OPERATOR_PASSWORD:?set MQTT_OPERATOR_PASSWORD}"
: "${MQTT_DEVICE_USER:?set MQTT_DEVICE_USER (the device id)}"
: "${MQTT_DEVICE_PASSWORD:?set MQTT_DEVICE_PASSWORD}"

# A device id is a topic level (docs/protocol.md) and must not be another user's name: the
# ACL's patterns apply to every user.
check_device() {
  case "$1" in
    agent|monitor|operator) echo "make-passwd.sh: device id '$1' is the name of another user" >&2; exit 2 ;;
  esac
  if ! printf '%s' "$1" | grep -Eq '^[A-Za-z0-9_.-]{1,64}$'; then
    echo "make-passwd.sh: device id '$1' is not 1 to 64 of [A-Za-z0-9_.-]" >&2
    exit 2
  fi
}

umask 077
tmp="$file.tmp"
: > "$tmp"
mosquitto_passwd -b "$tmp" agent "$MQTT_AGENT_PASSWORD"
mosquitto_passwd -b "$tmp" monitor "$MQTT_MONITOR_PASSWORD"
mosquitto_passwd -b "$tmp" operator "$MQTT_OPERATOR_PASSWORD"
check_device "$MQTT_DEVICE_USER"
mosquitto_passwd -b "$tmp" "$MQTT_DEVICE_USER" "$MQTT_DEVICE_PASSWORD"
devices="$MQTT_DEVICE_USER"
if [ -n "${MQTT_DEVICES_FILE:-}" ]; then
  while read -r id password rest; do
    case "$id" in ''|'#'*) continue ;; esac
    if [ -z "${password:-}" ] || [ -n "${rest:-}" ]; then
      echo "make-passwd.sh: $MQTT_DEVICES_FILE: need 'ID PASSWORD' on the line of '$id'" >&2
      exit 2
    fi
    check_device "$id"
    mosquitto_passwd -b "$tmp" "$id" "$password"
    devices="$devices $id"
  done < "$MQTT_DEVICES_FILE"
fi
# Mosquitto drops to its own user (uid 1883 in the eclipse-mosquitto image) before reading it.
if [ -n "${MQTT_PASSWD_OWNER:-}" ]; then
  chown "$MQTT_PASSWD_OWNER" "$tmp"
fi
mv "$tmp" "$file"
echo "wrote $file: agent, monitor, operator, devices $devices"
