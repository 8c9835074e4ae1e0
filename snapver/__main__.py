from snapver.cli import run

run()
