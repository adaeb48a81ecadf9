"""Model code: configs and presets, the Llama-family decoder, weight loading, model setup.

``setup`` needs no torch (it is what ``engine setup`` runs); the other modules do.
"""
