from grouppref.cli import main

main()
