"""Reports: what reads profiles and analyses and prints or writes them (fvcore's and DeepSpeed's
printouts, the memory table, the HTML report, JSON, CSV and trace files). Nothing below imports
them."""
