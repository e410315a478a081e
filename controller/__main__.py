from controller.main import run

run()
