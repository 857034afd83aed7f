from hpctrain.cli import main

raise SystemExit(main())
