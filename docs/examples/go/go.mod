module example.invalid/prefixscorer

go 1.19
