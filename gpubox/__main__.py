from gpubox.cli.main import main

raise SystemExit(main())
