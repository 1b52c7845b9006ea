from specroute.cli import main

raise SystemExit(main())
