#!/bin/sh
# As the official redis image's entrypoint: a redis-server started with no config file gets --protected-mode no,
# so that other containers of the network may connect (the network, not a password, is the boundary here).
set -e
if [ "$1" = "redis-server" ]; then
  case "${2:-}" in
    *.conf) ;;
    *) shift; set -- redis-server "$@" --protected-mode no ;;
  esac
fi
exec "$@"
