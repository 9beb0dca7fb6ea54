from nodeagent.cli import main

raise SystemExit(main())
