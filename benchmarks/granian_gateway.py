"""The gateway's app for granian, which imports an app by name: the config file is named by $GATEWAY_CONFIG.

For the server-choice measurement only (benchmarks/bench_servers.py): granian cannot
take the gateway's bounded HTTP protocol, so the gateway is not served this way.
"""
from __future__ import annotations

import os

from exports_common.config_loader import load_model
from gateway.app import create_app
from gateway.config import GatewayConfig

_path = os.environ["GATEWAY_CONFIG"]
app = create_app(load_model(_path, GatewayConfig), _path)
