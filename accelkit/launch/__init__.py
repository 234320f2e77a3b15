"""accelkit.launch"""
