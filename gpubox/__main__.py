# A Ctrl-C this early ends gpubox as it does later (gpubox/cli/main.py): exit 130, nothing said.
try:
    from gpubox.cli.main import main

    code = main()
except KeyboardInterrupt:
    code = 130

raise SystemExit(code)
