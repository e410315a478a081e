from controller.cli.main import run

run()
