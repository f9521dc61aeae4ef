"""fedshift: federated learning under label, feature and concept shift, and drift."""

__version__ = "0.1.0"
