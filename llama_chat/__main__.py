from llama_chat.cli import main

raise SystemExit(main())
