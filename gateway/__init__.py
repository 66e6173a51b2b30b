"""The public edge: routes from YAML, a plugin chain per route, a streaming proxy to the upstreams."""
