from companion.weights.cli import main

raise SystemExit(main())
