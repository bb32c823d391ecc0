"""The task declarations: one module per task (`TASK = <a training.app.tasks.Task subclass>()`), discovered by
training/app/tasks.py, which also searches every <dir>/training/tasks/ with <dir> on sys.path: a task of your own
can live outside this checkout (put it in <dir>/training/tasks/<name>.py and <dir> on PYTHONPATH)."""
