from snapver.entry import run

run()
