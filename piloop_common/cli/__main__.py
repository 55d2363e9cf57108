from piloop_common.cli import main

main()
