// Express as its guide writes it: app.listen(3000).
const express = require('express');

const app = express();
app.get('/', (req, res) => res.send(`Hello World from Express (pid ${process.pid})\n`));
app.get('/users/:id', (req, res) => res.json({ id: req.params.id, pid: process.pid }));

app.listen(3000, () => console.log('Example app listening on port 3000'));
