"""Shared pytest set-up: tests import helper modules that live beside them."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
