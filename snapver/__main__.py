from snapver.cli import main

main()
