"""Builds and launches the composed image search demo (Hugging Face Space entry point)."""
from engine.config import set_default_environment

# Gradio's usage analytics rebuild a summary after every event, so a long-running server slows down; off.
set_default_environment(GRADIO_ANALYTICS_ENABLED="False")

from demo.launch import launch_options, show_engine_log  # noqa: E402
from demo.ui import build_demo  # noqa: E402
from engine.config import Settings  # noqa: E402
from engine.process import configure_process  # noqa: E402
from engine.service import load_default_engine  # noqa: E402

show_engine_log()  # the console says what the start did (one line for a first start from the prebuilt index)
settings = Settings()  # every setting (README, 'Configuration'), read once
configure_process(settings)  # the decode budget (CIS_DECODE_BUDGET_MB), the offline sets' folders
engine = load_default_engine(settings)
demo = build_demo(settings, engine=engine)

if __name__ == "__main__":
    demo.launch(**launch_options(engine, settings))  # the one set of server options (demo/launch.py)
