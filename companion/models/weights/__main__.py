from companion.models.weights.cli import main

raise SystemExit(main())
